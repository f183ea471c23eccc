"""agent"""
